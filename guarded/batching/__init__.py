"""Batching of writes (group commit and write-behind): one place for the whole concern.

* :mod:`.batcher`: the :class:`~.batcher.Batcher`, its per-method queues, its backpressure
  (:class:`~.batcher.BatchSpace`) and its metrics; it knows nothing of stores.
* :mod:`.batch_writer`: the :class:`~.batch_writer.BatchWriter`, how a flush of one method reaches
  the backend (its bulk form, else bounded single writes) and what a failed flush becomes (held,
  or parked as bad data).

The bulk forms of the writes (:mod:`guarded.bulk_forms`) are shared with the dead-letter replay,
so they live below both. The durability (:class:`guarded.durability.owner.Durability`) owns the
batcher of a guard; the batching layer (:mod:`guarded.batching.batching_layer`) submits to it through a
port (:class:`guarded.durability.ports.WriteQueue`).

This package imports none of its modules: a module that needs the batcher imports
:mod:`.batcher` alone, without the writer's dependencies.
"""
