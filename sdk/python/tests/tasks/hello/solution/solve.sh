#!/bin/bash
# The oracle's solution.
echo "Hello, world!" > /app/hello.txt
