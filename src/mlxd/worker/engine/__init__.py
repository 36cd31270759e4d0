"""mlxd.worker.engine"""
