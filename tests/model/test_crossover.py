"""The measured few-rows limit: the kernel keeps a row count unless it is clearly slower (a fake clock)."""

from model.backends import crossover


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def path(self, seconds_per_rows):
        def run(x):
            self.now += seconds_per_rows(x.shape[0])
        return run


def test_a_tie_is_the_kernels_and_a_clear_loss_ends_its_share(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(crossover.time, "perf_counter", clock.perf_counter)
    onednn = clock.path(lambda rows: 1.0)
    # within the margin at every candidate: the kernel keeps them all
    assert crossover.measure_crossover(clock.path(lambda rows: 1.05), onednn, 8, 16) == 16
    # twice as slow from 6 rows on: its share ends at 4
    assert crossover.measure_crossover(clock.path(lambda rows: 1.0 if rows < 6 else 2.0), onednn, 8, 16) == 4
    assert crossover.measure_crossover(clock.path(lambda rows: 3.0), onednn, 8, 16) == 0
