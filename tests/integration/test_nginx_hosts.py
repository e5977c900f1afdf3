"""A policy's host against NGINX's reading of it: Debian's nginx as the
upstream, with a `server_name api.example.com` block of its own beside its
default server, and sluice in front of it with a policy on that host. Every
spelling of the Host field and of an absolute-form target (case, a trailing
dot, ports, the field twice, ...) that NGINX serves from the named server
must be counted by the policy: otherwise a client walks past a host's limit
by spelling the host so."""

import unittest

from harness import HOST, SluiceTestCase, free_port, server_block, start_nginx
from raw_http import status_and_body

HOSTS = [b"api.example.com", b"API.EXAMPLE.COM", b"api.example.com.", b"api.example.com:80",
         b"api.example.com:8080", b"api.example.com.:80", b"Api.Example.Com.", b"api.example.com:",
         b"api.example.com:0", b"api.example.com:080", b"[api.example.com]", b"api.example.com..",
         b"api.example.com%2e", b"x@api.example.com", b"api.example.com/x", b"api.example.com\\x",
         b"api%2eexample.com", b"API.example.com:443", b"other.example"]
TARGETS = [b"/", b"http://api.example.com/", b"http://API.EXAMPLE.COM./", b"https://api.example.com/",
           b"http://api.example.com:80/", b"http://x@api.example.com/", b"HTTP://api.example.com/"]


class NginxHostReadingTest(SluiceTestCase):
    def test_every_spelling_nginx_serves_as_the_host_is_counted(self):
        nginx_port = free_port()
        start_nginx(self, """pid %(dir)s/nginx.pid;
events { worker_connections 64; }
http { access_log off;
  server { listen %(host)s:%(port)d default_server; server_name _;
           location / { return 200 "OTHER"; } }
  server { listen %(host)s:%(port)d; server_name api.example.com;
           location / { return 200 "API"; } } }
""" % {"dir": self.tmpdir, "host": HOST, "port": nginx_port}, nginx_port)
        self.start_sluice(server_block(threads=1) + """\
routes: [{name: app, match: {path_prefix: /}, upstream: "http://%s:%d"}]
policies:
  - name: api
    match: {host: api.example.com}
    key: ["header:X-Try"]
    limits:
      - {algorithm: fixed_window, rate: 1/1m}
""" % (HOST, nginx_port))
        served, walked_past = 0, []
        for target in TARGETS:
            for host in HOSTS:
                field = b"Host: " + host + b"\r\n"
                for fields in (field, field + b"Host: other\r\n", b"Host: other\r\n" + field):
                    status, body = status_and_body(nginx_port, target, fields, host_field=False)
                    if status != 200 or body != b"API":
                        continue
                    served += 1
                    # A key of its own: the first request passes; the second
                    # is denied only if the first was counted.
                    key = b"X-Try: %d\r\n" % served
                    first, _ = status_and_body(self.sluice.port, target, fields + key,
                                               host_field=False)
                    second, _ = status_and_body(self.sluice.port, target, fields + key,
                                                host_field=False)
                    self.assertEqual(first, 200, (target, fields))
                    if second != 429:
                        walked_past.append((target, fields))
        self.assertGreater(served, 50, served)
        self.assertEqual(walked_past, [])


if __name__ == "__main__":
    unittest.main()
