"""x-fence, the stateful fence exchange type of one worker: its core `XFence` (`core`, put
together from `table`, `decisions`, `judging`, `gates`, `handover`, `queries`,
`persistence`: who is inside which fence, the ENTER / LEAVE decisions), the positions it holds
for a gate (`held`), the fences' polygons for the exact test (`shapes`), its durable formats
(`codec`), the proximity matcher (`roaming` and its `roam_*` parts) and its sidecar
(`sidecar`, `sidecar_inputs`, `sidecar_control`)."""
