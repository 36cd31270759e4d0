"""mlxd.supervisor.lifecycle"""
