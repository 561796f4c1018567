"""Where a job's mesh runs: the devices a run asks for (`DeviceRequest`) and the `Placement` of each kind (this
host's CPU devices or GPUs, a multi-host cluster, a TPU; kinds.py's KINDS and `place`), with what each kind
knows of its hardware: GPUs' facts and start-up, TPU access, peak FLOP/s, the precision that trains there.

The package itself imports nothing: main.py's parser reads cli/device_flags.py, which reads tpu_access.py, before
TensorFlow loads. The modules that import TensorFlow import `models` first (TensorFlow without Keras, and the
mesh-tensorflow compatibility alias before devices/tpu.py imports it)."""
