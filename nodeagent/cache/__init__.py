"""Node caches that make restarts cheap (WeFlex §3.3 "local loading"): container images
pre-pulled through CRI (:mod:`~nodeagent.cache.images`) and training checkpoints in a
size-bounded local directory (:mod:`~nodeagent.cache.checkpoints`). Both export their hit
ratios and measured throughputs, which feed the prelaunch window W
(:mod:`nodeagent.prelaunch`)."""
