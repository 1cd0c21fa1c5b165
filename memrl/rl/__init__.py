"""memrl.rl"""
