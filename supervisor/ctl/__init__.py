"""mlxd.supervisor.ctl"""
