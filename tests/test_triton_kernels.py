"""The Triton kernels of the PSRNN recurrence (pipeline/native/triton_kernels.py) in Triton's interpreter on the
CPU: tests/triton_interpreted.py holds them to the torch path, in a child pytest process because the interpreter
is chosen when a kernel is defined (``TRITON_INTERPRET=1`` at import). On a GPU machine tests/test_cuda.py runs
the compiled kernels against the CPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]' brings it on "
                                              "Linux x86-64)")
# Before 3.9 (3.6 seen) the interpreter cannot take a loop bound passed at run time (it converts a 1-element
# array with int()); the compiled kernels of those versions are checked on a GPU by tests/test_cuda.py.
OLD_INTERPRETER = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)


@pytest.mark.skipif(OLD_INTERPRETER, reason=f"triton {triton.__version__}'s interpreter; 3.9 or later runs these")
def test_triton_kernels_in_the_interpreter():
    child = Path(__file__).with_name("triton_interpreted.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(child)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
