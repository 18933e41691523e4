"""Market data: the HDF5 store, its validation, importers (Databento DBN, LOBSTER), the synthetic market."""
