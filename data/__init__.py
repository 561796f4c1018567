"""Data tooling for the model zoo: tokenizers, tfrecord creation and the tf.data input pipeline.

Import the submodules you need (``data.tokenizer``, ``data.create_tfrecords``, ``data.inputs``);
this package file deliberately imports nothing so that ``import data`` stays cheap and
free of TensorFlow start-up cost.
"""
