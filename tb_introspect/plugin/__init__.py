"""The Introspect TensorBoard plugin (no TensorFlow on this side).

- ``introspect_plugin``: the loader and plugin TensorBoard registers;
- ``reader``: data-provider reads into numpy series (``read_run``, ``read_logdir``);
- ``overview``: the server-side overview computed from those series;
- ``http_io``, ``assets``, ``cache``: JSON/gzip helpers, static files, caching.
"""
