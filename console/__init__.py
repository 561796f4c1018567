"""What the console shows and how a process starts: TensorFlow's C++ start-up chatter filtered off stderr
(stderr_filter.py), the runtimes' environment defaults set before TensorFlow loads (environment.py), TensorFlow's
import without Keras (tensorflow_import.py), and command lines whose errors are one `error:` line (arguments.py).
Imports nothing of the project: every entry point calls it first."""
