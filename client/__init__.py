"""dsa_client: gRPC clients for the `dsa` ensemble (streaming CLI, load generator).

This directory installs under the import name dsa_client, like kernels/ as dsa_kernels.
"""
