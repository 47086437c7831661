"""The tb-introspect demo: real models on scikit-learn's digits, one run per training situation.

``tb-introspect demo`` (or ``python demo/run_demo.py``) trains four small models and writes one
TensorBoard logdir with a run per situation: healthy, learning rate too high, dying ReLUs and
vanishing gradients. Importing this package is cheap: TensorFlow is imported only by
``tb_introspect.demo.models`` and ``tb_introspect.demo.run``.
"""
