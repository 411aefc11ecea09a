"""How the process's OpenMP threads wait between parallel regions: set by the command line before torch loads.

The cpu backend's kernels and torch's own ops run in one OpenMP runtime (torch's libgomp). With
OMP_WAIT_POLICY unset, an idle worker spins (300,000 times) before it sleeps. On a machine whose
cores are busy with other processes, the spinning workers and the others take turns on the cores and
a decode step waits at every region's barrier for a worker that is not running: on 2 shared cores
(load ~8) the default model decoded at 0.6-1.4 tokens/s with spinning against 12-18 with passive
waits (docs/performance.md, "OpenMP threads wait passively"). So the `radixserve` command makes the
waits passive unless the user chose: OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment wins.

libgomp reads the variable once, when it loads (with torch), so this must run before anything imports
torch; once torch is loaded it changes nothing and says so.
"""

import os
import sys

POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def choose_passive_waits(environ=os.environ, loaded_modules=sys.modules) -> str:
    """Set OMP_WAIT_POLICY=PASSIVE where the user set neither variable and torch is not loaded yet;
    returns a line for the startup log saying what holds."""
    chosen = {name: environ[name] for name in POLICY_VARIABLES if name in environ}
    if chosen:
        return "OpenMP waits as the environment says: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    if "torch" in loaded_modules:
        return "OpenMP waits as libgomp's default (torch was loaded before the policy could be set)"
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE; set OMP_WAIT_POLICY or GOMP_SPINCOUNT to choose)"

