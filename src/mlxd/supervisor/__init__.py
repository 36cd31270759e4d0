"""mlxd.supervisor"""
