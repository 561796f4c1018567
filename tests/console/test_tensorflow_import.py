"""console/tensorflow_import.py: TensorFlow loaded without Keras by whichever entry point loads it first, here
data/create_tfrecords.py's record writer (models/compat.py's use: tests/models/test_compat.py). Checked in a fresh
interpreter: this test process has imported everything already."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import os, sys, tempfile
from data import create_tfrecords
folder = tempfile.mkdtemp()
path = create_tfrecords._write_examples([[1, 2, 3]], folder, "probe", 0)
print("tensorflow" in sys.modules, "keras" in sys.modules)
import tensorflow as tf
print(sum(1 for _ in tf.data.TFRecordDataset(path)))
print(tf.keras.layers.Dense.__name__)  # tf.keras still loads Keras on first use
"""


def test_create_tfrecords_loads_tensorflow_without_keras():
    """The bug this catches: `import tensorflow` in data/create_tfrecords.py in place of `import_tensorflow()`
    (Keras 3 and scikit-learn loaded with it: seconds of every tokenization run), or import_tensorflow's hold on
    Keras gone."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["True False", "1", "Dense"]
