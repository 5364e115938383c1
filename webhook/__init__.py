"""configpin: pin every pod to the exact ConfigMap and Secret content it was created with."""

__version__ = "0.1.0"
