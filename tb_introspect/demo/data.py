"""scikit-learn's handwritten digits (shipped with the package, no download), split and scaled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Digits:
    """Train/validation split of the 8×8 digits as float32 images in [0, 1] with int labels."""

    x_train: np.ndarray  # (n, 8, 8, 1) float32
    y_train: np.ndarray  # (n,) int32
    x_val: np.ndarray
    y_val: np.ndarray

    @property
    def num_classes(self) -> int:
        return 10


def load_digits(val_fraction: float = 0.2, seed: int = 0) -> Digits:
    """Load the 1797 digits and make a stratified split that is the same on every call."""
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    x, y = _sk_load_digits(return_X_y=True)
    # Pixel values are integers 0..16; scale to [0, 1] and keep the image layout so
    # conv models and MLPs (which start with a Flatten) take the same arrays.
    x = (x.astype(np.float32) / 16.0).reshape(-1, 8, 8, 1)
    y = y.astype(np.int32)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=val_fraction, random_state=seed, stratify=y
    )
    return Digits(x_train, y_train, x_val, y_val)
