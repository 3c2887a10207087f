"""Tests against real engines (the real-engine CI stage, .ci/stage-real-engine.sh)."""
