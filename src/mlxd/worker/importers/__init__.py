"""mlxd.worker.importers"""
