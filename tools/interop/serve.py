#!/usr/bin/env python3
"""Runs a reference script's commands in one process, for a test that asks for several:
torch and transformers are imported once instead of once per command (seconds each).

    serve.py SCRIPT      SCRIPT defines main(argv); one request per stdin line (a JSON list of
                         the command's arguments), one reply per stdout line ({"rc", "out"}: the
                         command's exit status and what it printed), until stdin ends

Each command starts from the random state a fresh process has (torch, numpy, random), so its
results are those of `SCRIPT ARGS...` run alone. Used by tests/integration/reference_process.hpp.
"""
import contextlib
import importlib.util
import io
import json
import os
import random
import sys
import traceback


def main():
    path = sys.argv[1]
    spec = importlib.util.spec_from_file_location("reference_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    import numpy as np
    import torch

    fresh = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    # Replies on a copy of stdout; the descriptor 1 itself goes to stderr, so that what libraries
    # write there beside Python's sys.stdout (the Rust tokenizers do) cannot break a reply.
    sys.stdout.flush()
    reply_to = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        if not line.strip():
            continue
        torch.set_rng_state(fresh[0])
        np.random.set_state(fresh[1])
        random.setstate(fresh[2])
        out = io.StringIO()
        rc = 0
        try:
            with contextlib.redirect_stdout(out):
                result = script.main(json.loads(line))
            rc = result if isinstance(result, int) else 0
        except SystemExit as e:  # argparse, or a command's own exit
            if e.code is None or isinstance(e.code, int):
                rc = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                rc = 1
        except Exception:
            traceback.print_exc()
            rc = 1
        sys.stderr.flush()
        reply_to.write(json.dumps({"rc": rc, "out": out.getvalue()}) + "\n")
        reply_to.flush()


if __name__ == "__main__":
    main()
