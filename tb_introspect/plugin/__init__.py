"""The Introspect TensorBoard plugin (no TensorFlow on this side): it serves what the read
side (``tb_introspect.read``) reads through TensorBoard's data provider.

- ``introspect_plugin``: the loader and plugin TensorBoard registers;
- ``bounded``, ``sampling``, ``summaries``: the routes' reads, bounded in size, and the run's
  sampled read;
- ``overview``, ``run_document``, ``activity``, ``probes``, ``export``: the documents the
  routes serve;
- ``http_io``, ``assets``, ``cache``: JSON/gzip helpers, static files, caching.
"""
