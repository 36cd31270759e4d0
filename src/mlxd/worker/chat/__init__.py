"""mlxd.worker.chat"""
