#!/bin/bash
echo lemon > /workspace/hello.txt
