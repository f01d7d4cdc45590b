"""In-place rollouts (WeFlex §3.3, §3.2 step e): workload image edits and completed lends or
reclaims become hot restarts of the pods in their sandboxes. :mod:`.plan` and :mod:`.order`
are pure; :mod:`.controller` reads and writes through the store."""
