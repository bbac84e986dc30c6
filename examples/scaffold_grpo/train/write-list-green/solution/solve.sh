#!/bin/bash
echo green > /workspace/list.txt
