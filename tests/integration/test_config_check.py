"""`sluice serve --check-config FILE` (and `--config FILE --check`, the same
code): validate a config, exit 0 or 2."""

import glob
import os
import subprocess
import unittest

from harness import BINARY, SOURCE_DIR, SluiceTestCase, run_check, server_block

GOOD = server_block() + """\
policies:
  - name: a
    limits:
      - {algorithm: gcra, rate: 10/s, burst: 5}
"""


class ConfigCheckTest(SluiceTestCase):
    def test_valid_config_exits_0(self):
        code, out, err = run_check(GOOD, self.tmpdir)
        self.assertEqual(code, 0, (out, err))
        self.assertIn("ok", out)

    def test_bad_value_exits_2_and_names_file_line_and_key(self):
        bad = GOOD.replace("rate: 10/s", "rate: lots")
        line = bad.split("\n").index([l for l in bad.split("\n") if "lots" in l][0]) + 1
        code, out, err = run_check(bad, self.tmpdir, name="broken.yaml")
        self.assertEqual(code, 2, (out, err))
        self.assertRegex(err, r"broken\.yaml:%d\b" % line)
        self.assertIn("policies[0].limits[0].rate", err)

    def test_unknown_key_exits_2_and_names_file_line_and_key(self):
        bad = GOOD.replace("  threads: 2\n", "  threads: 2\n  thread: 4\n")
        code, out, err = run_check(bad, self.tmpdir, name="typo.yaml")
        self.assertEqual(code, 2, (out, err))
        self.assertRegex(err, r"typo\.yaml:5\b")
        self.assertIn("server.thread", err)

    def test_yaml_syntax_error_exits_2_and_names_file_line(self):
        code, out, err = run_check(GOOD + "  - name: [oops\n", self.tmpdir, name="syntax.yaml")
        self.assertEqual(code, 2, (out, err))
        self.assertRegex(err, r"syntax\.yaml:\d+")

    def test_missing_file_exits_2(self):
        path = os.path.join(self.tmpdir, "absent.yaml")
        p = subprocess.run([BINARY, "serve", "--config", path, "--check"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 2, p)
        self.assertIn(b"absent.yaml", p.stderr)

    def test_global_scope_without_shared_store_exits_2(self):
        bad = GOOD.replace("burst: 5}", "burst: 5, scope: global}")
        code, out, err = run_check(bad, self.tmpdir, name="scope.yaml")
        self.assertEqual(code, 2, (out, err))
        self.assertRegex(err, r"scope\.yaml:\d+")

    def check_config(self, text, name):
        """`sluice serve --check-config FILE` -> the finished process."""
        path = os.path.join(self.tmpdir, name)
        with open(path, "w") as f:
            f.write(text)
        return subprocess.run([BINARY, "serve", "--check-config", path], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30, cwd=self.tmpdir)

    def test_check_config_valid_exits_0(self):
        p = self.check_config(GOOD, "good.yaml")
        self.assertEqual(p.returncode, 0, p)
        self.assertIn("good.yaml: ok", p.stdout)

    def test_check_config_invalid_exits_2_with_file_line(self):
        bad = GOOD.replace("  threads: 2\n", "  threads: 2\n  thread: 4\n")
        p = self.check_config(bad, "typo.yaml")
        self.assertEqual(p.returncode, 2, p)
        self.assertRegex(p.stderr, r"typo\.yaml:5\b")
        self.assertIn("server.thread", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_check_config_and_config_together_are_refused(self):
        path = os.path.join(self.tmpdir, "good.yaml")
        with open(path, "w") as f:
            f.write(GOOD)
        p = subprocess.run([BINARY, "serve", "--config", path, "--check-config", path],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0, p)
        self.assertIn("--check-config", p.stderr)

    def test_examples_pass_the_check(self):
        if not SOURCE_DIR:
            self.skipTest("SLUICE_SOURCE_DIR is not set")
        examples = sorted(glob.glob(os.path.join(SOURCE_DIR, "examples", "*.yaml")))
        self.assertTrue(examples, "no examples/*.yaml")
        for path in examples:
            # Checked where they are: an example may name files beside it
            # (envoy.yaml's envoy_files).
            proc = subprocess.run([BINARY, "serve", "--config", path, "--check"],
                                  capture_output=True, text=True, timeout=30)
            self.assertEqual(proc.returncode, 0, (path, proc.stdout, proc.stderr))


if __name__ == "__main__":
    unittest.main()
