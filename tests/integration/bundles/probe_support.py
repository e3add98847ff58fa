"""What every confinement probe (a shipped or an operator test, a shipped or an operator custom
handler) starts with: the worker's paths it tries to reach and a check that an attempt failed."""

PRELUDE = '''
KEY, OUTBOX, STATE, OTHER, PID, PORT = {key!r}, {outbox!r}, {state!r}, {other!r}, {pid}, {port}

def blocked(action):
    try:
        action()
    except OSError:
        return True
    return False
'''
