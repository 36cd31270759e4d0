"""mlxd.supervisor.admin"""
