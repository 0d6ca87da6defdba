"""boxwatch: runtime monitors for production classifiers, built offline, shipped signed."""

__version__ = "0.1.0"
