"""Measuring a plan: the runner (:mod:`.runner`) opens each model's cells and hands them to
a worker group (:mod:`.isolation`), each cell measured in its own worker process
(:mod:`.worker`, forked from :mod:`.template`) on engines from the supply and the cache
(:mod:`.supply`, :mod:`.cache`); :mod:`.live` shows the run in the terminal."""
