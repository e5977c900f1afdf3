"""Self-test of the harness's RFC 8941 and Prometheus parsers: they must
reject malformed text, or the header and metrics tests prove nothing."""

import unittest

from harness import SfError, parse_metrics, parse_sf_list, ratelimit_members


class SfListParserTest(unittest.TestCase):
    def test_accepts_well_formed_lists(self):
        m = ratelimit_members('"login";q=40;w=60, "x";q=1;w=1')
        self.assertEqual(m, {"login": {"q": 40, "w": 60}, "x": {"q": 1, "w": 1}})
        m = ratelimit_members('"a\\"b";r=0;t=17,"c\\\\d";r=5')
        self.assertEqual(m, {'a"b': {"r": 0, "t": 17}, "c\\d": {"r": 5}})
        self.assertEqual(len(parse_sf_list('"a";q=1 ,\t"b";q=2')), 2)
        self.assertEqual(parse_sf_list(""), [])

    def test_rejects_malformed_lists(self):
        for text in ('"a";q=1,', '"a";q=1,,"b"', '"a" ;q=1', '"a";q=1 "b";q=2',
                     '"unterminated;q=1', '"bad\\escape";q=1', '"a";Q=1', '"a";q=',
                     '"a";q=1234567890123456', '"a";q=1.2345', '"tab\there"', ',"a"',
                     '"a";q=1;', '"a";=1'):
            with self.assertRaises(SfError, msg=text):
                parse_sf_list(text)

    def test_ratelimit_members_must_be_strings_with_integer_params(self):
        for text in ('login;q=40', '"a";q=1.5', '"a";r=-1', '"a";q=?1', '"a";q=1, "a";q=2',
                     '"a";t="5"'):
            with self.assertRaises(SfError, msg=text):
                ratelimit_members(text)


class MetricsParserTest(unittest.TestCase):
    def test_parses_samples(self):
        samples = parse_metrics('# HELP x y\n# TYPE x counter\nx{a="1",b="q\\"z"} 3\ny 4.5\n'
                                'h_bucket{le="+Inf"} 2\n')
        self.assertEqual(samples, [("x", {"a": "1", "b": 'q"z'}, 3.0), ("y", {}, 4.5),
                                   ("h_bucket", {"le": "+Inf"}, 2.0)])

    def test_rejects_malformed_lines(self):
        for text in ("x{a=1} 3\n", "x 3 4 5\n", "x{a=\"1\" 3\n", "1x 3\n", "x\n", "x{a=\"1\"} three\n"):
            with self.assertRaises(ValueError, msg=text):
                parse_metrics(text)


if __name__ == "__main__":
    unittest.main()
