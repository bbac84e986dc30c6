#!/bin/bash
echo maple > /workspace/hello.txt
