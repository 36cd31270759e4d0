"""mlxd.worker.api"""
