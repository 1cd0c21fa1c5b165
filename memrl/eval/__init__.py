"""memrl.eval"""
