#!/bin/bash
echo stone > /workspace/hello.txt
