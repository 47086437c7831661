"""The read side: a run's logged statistics as numpy series (numpy and TensorBoard only).

- ``series``: the run data model (``TagInfo``, ``Series``, ``RunSeries``, ``align`` /
  ``Aligned``, ``probes_of``);
- ``provider``: a run read through a TensorBoard data provider (the plugin's, or a local one
  over a log directory) and assembled into a ``RunSeries`` (``read_run``, ``read_logdir``);
- ``json_values``: NaN and ±Inf -> ``null`` for JSON.

The plugin's routes and overview, the findings (``diagnose``, and ``on_finding=`` during
training), ``tb-introspect diagnose`` and the demo all read runs through here; nothing here
imports TensorFlow or the plugin (``docs/design.md``).
"""

from tb_introspect.read.provider import read_logdir, read_run
from tb_introspect.read.series import Aligned, RunSeries, Series, TagInfo, align, probes_of

__all__ = ["Aligned", "RunSeries", "Series", "TagInfo", "align", "probes_of", "read_logdir",
           "read_run"]
