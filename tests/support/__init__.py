"""Test support shared by every test package. Area-specific helpers stay in each package's
``support.py`` and import from here.

* :mod:`.layers`: one method's ``MethodSetup`` and a ``Call`` of it, to drive a single layer;
* :mod:`.scripted`: scripted inner services (tower-test's mock): ``ScriptedService`` (expect a
  call, answer it with a value, an error or a hang), ``GatedService`` (calls stay in until let go);
* :mod:`.ports`: scripted fakes of the durability ports (held writes, the key gate, the write
  queue, the lifecycle) for the durability-facing layers;
* :mod:`.records`: the records tests write (numbered events, valid records with one field changed);
* :mod:`.metrics`: reading a Prometheus registry (a sample, calls by outcome, counters summed);
* :mod:`.aio`: async helpers (``settle``, ``eventually``).
"""
