#!/bin/bash
echo sugar > /workspace/hello.txt
