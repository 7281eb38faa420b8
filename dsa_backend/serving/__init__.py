"""Serving dsa_backend from Triton: request parsing, the python models' shared I/O, server tools."""
