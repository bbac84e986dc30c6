#!/bin/bash
echo robot > /workspace/hello.txt
