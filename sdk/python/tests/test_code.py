"""The code interpreter through the SDK: run_code and code contexts, on a
sandbox of the code-interpreter template. cmd/atoll's TestCodeInterpreter
builds the template and runs this with ATOLL_TEST_CODE_TEMPLATE set to its
name; without it the tests skip."""

from __future__ import annotations

import base64
import os
import time
import unittest

import atoll

from .support import TestCase

TEMPLATE = os.environ.get("ATOLL_TEST_CODE_TEMPLATE", "")


@unittest.skipUnless(TEMPLATE, "ATOLL_TEST_CODE_TEMPLATE is not set: run through cmd/atoll's TestCodeInterpreter")
class CodeTest(TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.sb = self.sandbox(template=TEMPLATE)

    def test_state_streams_and_results(self) -> None:
        self.c.run_code(self.sb.id, "a = 6")
        # Jupyter may send one print as two messages ("one", then "\n"):
        # adjacent messages of one stream are joined.
        seen = []

        def add(kind, text):
            if seen and seen[-1].startswith(kind + " ") and kind != "result":
                seen[-1] += text
            else:
                seen.append(kind + " " + text)
        ex = self.c.run_code(self.sb.id, "import sys\nprint('one', flush=True)\n"
                             "print('two', file=sys.stderr, flush=True)\na * 7",
                             on_stdout=lambda s: add("out", s),
                             on_stderr=lambda s: add("err", s),
                             on_result=lambda r: add("result", r.text or ""))
        self.assertEqual(ex.text, "42")
        self.assertIsNone(ex.error)
        self.assertEqual("".join(ex.logs.stdout), "one\n")
        self.assertEqual("".join(ex.logs.stderr), "two\n")
        self.assertGreaterEqual(ex.execution_count, 2)
        self.assertEqual(seen, ["out one\n", "err two\n", "result 42"])
        # envs for this execution only.
        code = "import os\nprint(os.environ.get('GREETING'))"
        self.assertEqual("".join(self.c.run_code(self.sb.id, code, envs={"GREETING": "hej"}).logs.stdout), "hej\n")
        self.assertEqual("".join(self.c.run_code(self.sb.id, code).logs.stdout), "None\n")

    def test_error_and_plot(self) -> None:
        errs = []
        ex = self.c.run_code(self.sb.id, "raise KeyError('k')", on_error=errs.append)
        self.assertEqual(ex.error.name, "KeyError")
        self.assertIn("KeyError", ex.error.traceback)
        self.assertEqual(errs, [ex.error])
        ex = self.c.run_code(self.sb.id, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        pngs = [r for r in ex.results if r.png]
        self.assertEqual(len(pngs), 1, ex.results)
        self.assertTrue(base64.b64decode(pngs[0].png).startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertIn("png", pngs[0].formats())

    def test_contexts(self) -> None:
        cc = self.c.create_code_context(self.sb.id, cwd="/tmp")
        self.assertEqual((cc.language, cc.cwd), ("python", "/tmp"))
        self.assertIn(cc.id, [x.id for x in self.c.list_code_contexts(self.sb.id)])
        self.c.run_code(self.sb.id, "b = 1", context=cc)
        self.assertEqual("".join(self.c.run_code(self.sb.id, "import os\nprint(os.getcwd())", context=cc.id).logs.stdout), "/tmp\n")
        # Its own state: the default context has no b.
        self.assertEqual(self.c.run_code(self.sb.id, "b").error.name, "NameError")
        self.c.restart_code_context(self.sb.id, cc)
        self.assertEqual(self.c.run_code(self.sb.id, "b", context=cc).error.name, "NameError")
        self.assertEqual("".join(self.c.run_code(self.sb.id, "echo $((2 + 3))", language="bash").logs.stdout), "5\n")
        js = self.c.create_code_context(self.sb.id, language="ts")
        self.assertEqual(js.language, "typescript")
        self.c.run_code(self.sb.id, "const n: number = 6", context=js)
        ex = self.c.run_code(self.sb.id, "console.log('ts')\nn * 7", context=js)
        self.assertEqual(("".join(ex.logs.stdout), ex.text), ("ts\n", "42"))
        self.c.remove_code_context(self.sb.id, js)
        self.c.remove_code_context(self.sb.id, cc)
        self.assertNotIn(cc.id, [x.id for x in self.c.list_code_contexts(self.sb.id)])
        with self.assertRaises(atoll.NotFound):
            self.c.run_code(self.sb.id, "1", context=cc)
        with self.assertRaises(atoll.Invalid):
            self.c.run_code(self.sb.id, "1", context=cc, language="python")

    def test_timeout(self) -> None:
        self.c.run_code(self.sb.id, "t = 3")
        t0 = time.monotonic()
        with self.assertRaises(atoll.Unavailable):
            self.c.run_code(self.sb.id, "import time\nprint('start', flush=True)\ntime.sleep(60)", timeout=1)
        self.assertLess(time.monotonic() - t0, 10)
        # Interrupted, not killed: the state is still there.
        self.assertEqual(self.c.run_code(self.sb.id, "t").text, "3")


if __name__ == "__main__":
    unittest.main()
