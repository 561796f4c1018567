"""`python main.py --selfcheck`: the device check, a tiny model trained on the devices against the CPU."""
