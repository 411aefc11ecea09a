"""How the process's OpenMP threads wait between parallel regions: set by the command line before torch loads.

The cpu backend's kernels and torch's own ops run in one OpenMP runtime (torch's libgomp). A decode step
is many short parallel regions (the default model: ~120 a token), and between them an idle worker spins
GOMP_SPINCOUNT times before it sleeps (300,000 with nothing set). Two failures bound the choice:
- spinning long, on a machine whose cores are busy with other processes, the spinning workers and the
  others take turns on the cores and a step waits at every barrier for a worker that is not running: on 2
  shared cores (load ~8) the default model decoded at 0.6-1.4 tokens/s with libgomp's default against
  12-18 with passive waits (docs/performance.md, "OpenMP threads wait passively");
- sleeping at once (OMP_WAIT_POLICY=PASSIVE), every region wakes its workers through the kernel: on a quiet
  AMX Xeon the default model decoded at 50 tokens/s in process, against 87 with a spin of 3,000 and 104
  spinning always (docs/performance.md, "OpenMP waits: a short spin").
So the `radixserve` command sets GOMP_SPINCOUNT=3000 (tens of microseconds): at load ~5 on 2 cores it
decoded at 22-23 tokens/s against passive's 17-32, no collapse. The user's OMP_WAIT_POLICY or GOMP_SPINCOUNT
in the environment wins.

libgomp reads the variable once, when it loads (with torch), so this must run before anything imports
torch; once torch is loaded it changes nothing and says so.
"""

import os
import sys

POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = "3000"  # an idle worker's spins before it sleeps (why: above)


def choose_omp_waits(environ=os.environ, loaded_modules=sys.modules) -> str:
    """Set GOMP_SPINCOUNT=SPIN_COUNT where the user set neither variable and torch is not loaded yet;
    returns a line for the startup log saying what holds."""
    chosen = {name: environ[name] for name in POLICY_VARIABLES if name in environ}
    if chosen:
        return "OpenMP waits as the environment says: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    if "torch" in loaded_modules:
        return "OpenMP waits as libgomp's default (torch was loaded before the policy could be set)"
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return (f"OpenMP threads spin briefly, then sleep (GOMP_SPINCOUNT={SPIN_COUNT}; set OMP_WAIT_POLICY or "
            "GOMP_SPINCOUNT to choose)")
