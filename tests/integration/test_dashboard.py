"""The dashboard at / on the admin listener, in a real browser.

Headless Chromium, driven by Selenium (Debian's chromium, chromium-driver and
python3-selenium; scripts/deps.sh installs them, and without them this test
fails rather than skips), opens the page of a `sluice serve` that has just
denied one key many times, and checks what an operator would look at:

- the live chart of the tight policy plots denials (the card's data
  attributes hold the numbers it plotted last), and it keeps updating;
- the top keys table of that policy names the hammered key, and a hostile
  key shows as text (no element is made of it);
- clicking the key fills the lookup, which says the next request is denied
  with nothing remaining;
- the simulator runs a built-in scenario and draws a chart per run, and an
  invalid scenario shows the server's own error;
- the browser logged no error (a Content-Security-Policy violation is one).

Screenshots go to <build folder>/test-output/dashboard/ (the build folder
is SLUICE_BUILD_DIR, or the folder of the sluice binary).
"""

import os
import shutil
import tempfile
import time
import unittest

from harness import BINARY, SluiceTestCase, request, server_block

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 10

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
    SELENIUM_ERROR = None
except ImportError as e:  # reported by setUpClass as a failure
    SELENIUM_ERROR = e

CONFIG = server_block() + """\
policies:
  - name: api
    limits:
      - {algorithm: token_bucket, rate: 100/s, burst: 200}
  - name: login
    limits:
      - {algorithm: sliding_log, rate: 5/h}          # no window boundary to reset it mid-test
      - {algorithm: token_bucket, rate: 50/h, burst: 50}
  - name: shadowed
    shadow: true
    limits:
      - {algorithm: gcra, rate: 1/s, burst: 2}
"""

KEY = "user/7 x"                          # a "/" and a space: percent-encoded in the lookup
HOSTILE = '<img src=x onerror="window.pwned=1">'


def output_dir():
    build = os.environ.get("SLUICE_BUILD_DIR") or os.path.dirname(os.path.abspath(BINARY))
    path = os.path.join(build, "test-output", "dashboard")
    os.makedirs(path, exist_ok=True)
    return path


class DashboardTest(SluiceTestCase):
    @classmethod
    def setUpClass(cls):
        missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
        if SELENIUM_ERROR is not None or missing:
            raise AssertionError(
                "the dashboard test needs Debian's chromium, chromium-driver and python3-selenium "
                "(scripts/deps.sh, SLUICE_TEST_PACKAGES): missing %s"
                % ", ".join(missing + (["selenium (%s)" % SELENIUM_ERROR] if SELENIUM_ERROR else [])))

    def setUp(self):
        super().setUp()
        self.start_sluice(CONFIG)
        self.profile = tempfile.mkdtemp(prefix="sluice-chromium-")
        self.addCleanup(shutil.rmtree, self.profile, True)
        self.driver = self.start_browser()
        self.addCleanup(self.driver.quit)
        self.shots = output_dir()

    def start_browser(self):
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--window-size=1440,1000", "--user-data-dir=" + self.profile):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The driver's path given: Selenium never looks for (or downloads) one.
        service = Service(executable_path=CHROMEDRIVER,
                          log_path=os.path.join(self.tmpdir, "chromedriver.log"))
        return webdriver.Chrome(service=service, options=options)

    # -- helpers --

    def url(self, path="/"):
        return "http://127.0.0.1:%d%s" % (self.sluice.admin_port, path)

    def wait(self, what, condition, timeout=WAIT_S):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(
                lambda d: condition())
        except TimeoutException:
            self.screenshot("failed")
            self.fail("the page never showed %s; browser log: %s" % (what, self.browser_log()))

    def card(self, kind, policy):
        found = self.driver.find_elements(
            By.CSS_SELECTOR, "#%s [data-policy]" % kind)
        for c in found:
            if c.get_attribute("data-policy") == policy:
                return c
        return None

    def number(self, kind, policy, name):
        """data-<name> of a policy's card, as a number (-1 while there is none)."""
        card = self.card(kind, policy)
        value = card.get_attribute("data-" + name) if card is not None else None
        return int(value) if value not in (None, "") else -1

    def screenshot(self, name):
        # The whole page: the window as tall as the document.
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1440, min(max(height, 1000), 6000))
        self.driver.execute_script("window.scrollTo(0, 0)")
        self.driver.save_screenshot(os.path.join(self.shots, name + ".png"))

    def browser_log(self):
        return [e for e in self.driver.get_log("browser")]

    def deny_traffic(self):
        statuses = [self.check("login", KEY).status for _ in range(12)]
        self.assertEqual(statuses.count(200), 5, statuses)
        self.assertEqual(statuses.count(429), 7, statuses)
        for _ in range(8):
            self.check("login", HOSTILE)
        for i in range(30):
            self.assertEqual(self.check("api", "client-%d" % (i % 3)).status, 200)
        for _ in range(6):
            self.check("shadowed", "s")

    def check_assets(self):
        """The page and its bundles, as a browser gets them."""
        for path, kind in (("/", "text/html"), ("/assets/dashboard.js", "text/javascript"),
                           ("/assets/dashboard.css", "text/css")):
            r = request(self.sluice.admin_port, "GET", path)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.content_type, kind, r)
            self.assertEqual(r.header("X-Content-Type-Options"), "nosniff", r)
            self.assertIn("script-src 'self'", r.header("Content-Security-Policy") or "", r)
            self.assertNotIn("unsafe", r.header("Content-Security-Policy"), r)
            head = request(self.sluice.admin_port, "HEAD", path)
            self.assertEqual((head.status, head.body), (200, b""), head)
        self.assert_problem(request(self.sluice.admin_port, "GET", "/assets/nope.js"), 404)

    # -- the test: one page load, every panel --

    def test_an_operator_finds_the_limited_key_and_why(self):
        self.deny_traffic()
        self.check_assets()
        self.driver.get(self.url())

        # Live decisions: the tight policy's chart plots its denials.
        # (A second is plotted once it is over: wait for the last one.)
        # The shadowed policy's requests came last and may fall in a later
        # second than the others: wait for its denials too.
        self.wait("the traffic in the charts", lambda: (
            self.number("live", "login", "denied-total"), self.number("live", "login", "allowed-total"),
            self.number("live", "api", "allowed-total")) == (7 + 3, 5 + 5, 30)
            and self.number("live", "shadowed", "shadow-denied-total") > 0)
        login = self.card("live", "login")
        self.assertGreater(self.number("live", "login", "points"), 0)
        self.assertTrue(login.find_elements(By.CSS_SELECTOR, "canvas"), "no uPlot canvas")
        # ... and updates every second without a reload.
        end = login.get_attribute("data-end-ms")
        self.wait("the chart moving on", lambda: self.card("live", "login").get_attribute("data-end-ms") != end,
                  timeout=4)

        # Top limited keys: the hammered key, and the hostile one as text.
        def top_keys():
            card = self.card("top", "login")
            if card is None:
                return []
            return [r.get_attribute("data-key") for r in card.find_elements(By.CSS_SELECTOR, "tbody tr")]
        self.wait("the hammered key among login's top keys", lambda: KEY in top_keys() and HOSTILE in top_keys())
        top = self.card("top", "login")
        first = top.find_element(By.CSS_SELECTOR, "tbody tr")
        self.assertEqual(first.get_attribute("data-key"), KEY)
        self.assertEqual(first.find_element(By.CSS_SELECTOR, ".key-link").text, KEY)
        self.assertGreaterEqual(int(first.get_attribute("data-denied")), 7)
        self.assertIn(HOSTILE, top.text)
        self.assertEqual(self.driver.find_elements(By.CSS_SELECTOR, "#top img"), [])
        self.assertIsNone(self.driver.execute_script("return window.pwned"))

        # Why was I limited: a click on the key looks it up.
        first.find_element(By.CSS_SELECTOR, ".key-link").click()
        result = self.driver.find_element(By.ID, "lookup-result")
        self.wait("the lookup's verdict", lambda: result.get_attribute("data-verdict") == "denied")
        self.assertEqual(self.driver.find_element(By.ID, "lookup-key").get_attribute("value"), KEY)
        self.assertEqual(Select(self.driver.find_element(By.ID, "lookup-policy"))
                         .first_selected_option.get_attribute("value"), "login")
        self.assertEqual(result.get_attribute("data-remaining"), "0")
        self.assertIn("Next request: denied", result.text)
        rows = result.find_elements(By.CSS_SELECTOR, "tbody tr")
        self.assertEqual([r.get_attribute("data-remaining") for r in rows], ["0", "45"])

        # What is in force: the policies and the store.
        self.wait("the policies in force", lambda: len(self.driver.find_elements(
            By.CSS_SELECTOR, "#policies-body tr[data-policy]")) == 3)
        self.assertIn("sliding_log 5/h", self.driver.find_element(By.ID, "policies-body").text)
        self.wait("the memory store", lambda: " of " in self.driver.find_element(By.ID, "mem-keys").text)
        # The listeners, where they were bound (plain HTTP here).
        listeners = self.driver.find_element(By.ID, "listeners")
        self.wait("the listeners", lambda: "admin 127.0.0.1:" in listeners.text)
        self.assertIn("main 127.0.0.1:%d" % self.sluice.port, listeners.text)
        self.assertNotIn("TLS", listeners.text)
        self.assertTrue(self.driver.find_element(By.ID, "version").text.startswith("v"))

        # The simulator: a built-in scenario, drawn per run.
        scenario = Select(self.driver.find_element(By.ID, "sim-scenario"))
        self.wait("the scenarios", lambda: len(scenario.options) > 0)
        scenario.select_by_value("login-storm")
        self.assertIn("name: login-storm", self.driver.find_element(By.ID, "sim-yaml").get_attribute("value"))
        self.driver.find_element(By.ID, "sim-run").click()
        sim = self.driver.find_element(By.ID, "sim-result")
        self.wait("the simulation's runs", lambda: (sim.get_attribute("data-runs") or "0") != "0")
        runs = sim.find_elements(By.CSS_SELECTOR, ".sim-card")
        self.assertEqual(len(runs), int(sim.get_attribute("data-runs")))
        fixed = [r for r in runs if r.get_attribute("data-run") == "fixed_window 40/min"]
        self.assertEqual(len(fixed), 1)
        self.assertEqual(int(fixed[0].get_attribute("data-admitted-total")), 400)
        self.assertGreater(int(fixed[0].get_attribute("data-points")), 0)
        self.assertTrue(fixed[0].find_elements(By.CSS_SELECTOR, "canvas"))
        self.assertIn("fixed_window 40/min", sim.find_element(By.CSS_SELECTOR, ".sim-table").text)
        # A checkbox hides a run's chart.
        sim.find_element(By.CSS_SELECTOR, ".sim-table tbody tr input[type=checkbox]").click()
        self.assertFalse(fixed[0].is_displayed())
        sim.find_element(By.CSS_SELECTOR, ".sim-table tbody tr input[type=checkbox]").click()
        self.assertTrue(fixed[0].is_displayed())
        self.screenshot("dashboard")
        # Nothing went wrong in the page so far: no error, no CSP violation.
        self.assertEqual([e for e in self.browser_log() if e.get("level") == "SEVERE"], [])

        # An invalid scenario: the server's own words, and the runs stay.
        yaml = self.driver.find_element(By.ID, "sim-yaml")
        yaml.clear()
        yaml.send_keys("duration: 1m\nclients:\n  - traffic: [{poisson: 10/s}]\n"
                       "limiters:\n  - {algorithm: gcra, rate: 5/s, burts: 5}\n")
        self.driver.find_element(By.ID, "sim-run").click()
        error = self.driver.find_element(By.ID, "sim-error")
        self.wait("the scenario's error", lambda: error.is_displayed())
        self.assertIn("scenario:5: limiters[0].burts: unknown key", error.text)
        self.assertIn("HTTP 400", error.text)
        self.screenshot("simulator-error")

        # The one error since: the browser reporting the 400 it was answered.
        errors = [e for e in self.browser_log() if e.get("level") == "SEVERE" and not (
            e.get("source") == "network" and "/v1/sim " in e.get("message", "") and "400" in e["message"])]
        self.assertEqual(errors, [])


if __name__ == "__main__":
    unittest.main()
