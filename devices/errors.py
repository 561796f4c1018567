"""The error a device list raises when it does not fit the machine or the mesh (devices/placement.py,
devices/gpus.py); main.py prints it as one `error:` line."""


class DeviceError(ValueError):
    """A device list that does not fit the machine or the mesh. One line, names the fix."""
