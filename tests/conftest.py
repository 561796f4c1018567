"""Shared test setup.

TensorFlow can split the CPU into logical devices only before it starts, and pytest runs every test in one
process, so the split happens here, once, at import: four CPU devices serve meshes of 1, 2 and 4.
"""
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from console import runtime_defaults  # noqa: E402

runtime_defaults()  # TensorFlow's kernels as every entry point sets them up (oneDNN on x86-64), before it loads

import models  # noqa: E402,F401  (compatibility alias before mesh_tensorflow)
from runtime import devices  # noqa: E402  # noqa: E402

CPU_DEVICES = devices.configure(devices.cpu_devices(4))

import tensorflow.compat.v1 as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")
