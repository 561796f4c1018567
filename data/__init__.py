"""Data tooling for the model zoo: tokenizers, tfrecord creation, the tf.data input pipeline and the eval tasks'
examples.

Import the submodules you need (``data.tokenizer``, ``data.create_tfrecords``, ``data.inputs``);
this package file deliberately imports nothing so that ``import data`` stays cheap and
free of TensorFlow start-up cost.
"""
