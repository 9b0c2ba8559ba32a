"""What a run will measure, decided before anything is measured: the spec and the run's
policy (:mod:`.config`), the cells it expands to (:mod:`.cells`) and what they will cost
(:mod:`.estimate`)."""
