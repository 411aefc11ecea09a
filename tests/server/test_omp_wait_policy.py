"""The `radixserve` command makes OpenMP's idle threads spin briefly, then sleep, unless the user chose, before torch loads."""

import os
import subprocess
import sys

from server.omp_wait_policy import choose_omp_waits


def test_sets_a_short_spin_when_the_user_chose_nothing_and_torch_is_not_loaded():
    environ = {"PATH": "/bin"}
    line = choose_omp_waits(environ, loaded_modules={})
    assert environ == {"PATH": "/bin", "GOMP_SPINCOUNT": "3000"}
    assert "GOMP_SPINCOUNT=3000" in line


def test_the_users_choice_wins():
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        environ = dict(chosen)
        line = choose_omp_waits(environ, loaded_modules={})
        assert environ == chosen
        assert all(f"{k}={v}" in line for k, v in chosen.items())


def test_too_late_once_torch_is_loaded_and_says_so():
    environ = {}
    line = choose_omp_waits(environ, loaded_modules={"torch": object()})
    assert environ == {}
    assert "torch was loaded" in line


def test_the_command_line_sets_it_before_torch_loads():
    # what `radixserve ...` runs first: cli.main chooses before its handler imports anything heavy
    code = ("import sys\nfrom server import cli\n"
            "cli._build_parser = lambda: (_ for _ in ()).throw(SystemExit(0))\n"
            "try:\n    cli.main([])\nexcept SystemExit:\n    pass\n"
            "import os\nprint(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3000", "False"]
