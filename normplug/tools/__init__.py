"""Console scripts of normplug."""
