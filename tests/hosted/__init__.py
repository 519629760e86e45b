"""The hosted-runtime tier's helpers: the images' pins (*.txt), their environments (stacks.py) and the
flows run inside them (flows.py); tests/test_hosted.py drives them."""
