"""mlxd.worker.grammar"""
