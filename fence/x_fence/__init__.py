"""x-fence, the stateful fence exchange type of one worker: its core (`core`: who is inside
which fence, the ENTER / LEAVE decisions), the events it emits (`events`), the fences'
polygons for the exact test (`shapes`), its durable state (`codec`: formats, `journal`:
snapshot and journal files) and its sidecar (`sidecar`)."""
