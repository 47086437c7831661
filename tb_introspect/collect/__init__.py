"""Training-side collection: the Keras callback and the custom-loop ``Introspector``."""
