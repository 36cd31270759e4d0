"""mlxd.worker.cache"""
